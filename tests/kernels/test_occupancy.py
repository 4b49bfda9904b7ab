"""kernels/occupancy.py: programs an SM holds, and how full a launch's waves are (triton-v1.15's launch rule)."""
import pytest

from sits.kernels import occupancy


H100_SM = dict(regs=65536, shared=233472, threads=2048, blocks=32)   # an sm_90 SM, as torch's properties give it


def test_programs_per_sm_takes_the_tightest_of_registers_shared_memory_warps_and_blocks():
    # triton-v1.8's four-warp FP8 decode attention: ~150 registers a thread, three programs an SM (its docstring)
    assert occupancy.programs_per_sm(150, 40_000, 4, H100_SM) == 3          # registers: 65536 / (4 x 32 x 152)
    assert occupancy.programs_per_sm(64, 60_000, 4, H100_SM) == 3           # shared memory: 233472 / 61024
    assert occupancy.programs_per_sm(32, 0, 1, H100_SM) == 32               # resident blocks
    assert occupancy.programs_per_sm(32, 0, 8, H100_SM) == 8                # threads: 2048 / 256
    assert occupancy.programs_per_sm(255, 0, 8, H100_SM) == 1
    assert occupancy.programs_per_sm(80, 300_000, 1, H100_SM) == 0          # does not fit


def test_wave_fill_is_the_busy_share_of_every_wave():
    assert occupancy.wave_fill(1056, 1056) == 1.0
    assert occupancy.wave_fill(2112, 1056) == 1.0
    assert occupancy.wave_fill(768, 1056) == pytest.approx(0.727, abs=1e-3)
    assert occupancy.wave_fill(1536, 1056) == pytest.approx(0.727, abs=1e-3)
    assert occupancy.wave_fill(1100, 1056) == pytest.approx(0.521, abs=1e-3)
    assert occupancy.wave_fill(0, 1056) == 0.0 and occupancy.wave_fill(5, 0) == 0.0
