"""Which `sits-engine serve` flags an operator may add to a variant (DeploySpec.production_args / canary_args), and
which environment variables (DeploySpec.env). Pure.

The deployer owns everything that says where an engine listens, what it is called, where its telemetry goes and
whether it misbehaves on purpose: `--host`, `--port`, `--env`, `--service`, `--model`, `--kernels`,
`--tensor-parallel-size` (spec fields),
`--otel-exporter`, `--otlp-endpoint` and the `--fault-*` flags. An operator's flag is accepted only if it is on the
allow-list below, spelled out in full (argparse would take `--ho` for `--host`), with a value where it takes one;
anything else is a ValidationError naming the flag. Fault injection is for tests and benchmarks: DeploySpec's
`canary_faults`, which no API or CLI field sets.
"""
from __future__ import annotations

import math
import re
from typing import Callable, Iterable, Sequence

from sits.control_plane.errors import ValidationError

# flag -> takes a value
OPERATOR_FLAGS: dict[str, bool] = {
    "--device": True, "--dtype": True, "--max-num-seqs": True, "--max-waiting": True,
    "--max-num-batched-tokens": True, "--max-model-len": True, "--num-kv-blocks": True,
    "--max-blocks-per-tenant": True, "--quantization": True, "--seed": True, "--enforce-eager": False,
    "--served-model-name": True, "--no-warmup": False, "--log-level": True, "--no-access-log": False,
    "--header-timeout-s": True, "--body-timeout-s": True, "--gpu-memory-utilization": True, "--kv-cache-dtype": True,
}


def _integer(lo: int, hi: int) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        if not re.fullmatch(r"-?\d{1,20}", v) or not lo <= int(v) <= hi:
            return f"must be an integer from {lo} to {hi}"
        return None
    return check


def _seconds(hi: float) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        if not _number(v) or not math.isfinite(float(v)) or not 0 < float(v) <= hi:
            return f"must be more than 0 and at most {hi:g} seconds"
        return None
    return check


def _fraction(v: str) -> str | None:
    if not _number(v) or not math.isfinite(float(v)) or not 0 < float(v) <= 1:
        return "must be a fraction in (0, 1]"
    return None


def _one_of(*choices: str) -> Callable[[str], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


def _device(v: str) -> str | None:
    return None if v in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d{1,2}", v) else \
        "must be auto, cpu, cuda or cuda:N"


# the values an operator's flag may take, checked when the rollout is created (the engine would refuse the rest only
# when it starts, or -- a header timeout of 1e9 s -- silently turn a guard off)
FLAG_VALUES: dict[str, Callable[[str], str | None]] = {
    "--device": _device, "--dtype": _one_of("auto", "float32", "bfloat16", "float16"),
    "--max-num-seqs": _integer(1, 4096), "--max-waiting": _integer(1, 1_000_000),
    "--max-num-batched-tokens": _integer(1, 1 << 20), "--max-model-len": _integer(1, 1 << 20),
    "--num-kv-blocks": _integer(1, 1 << 22), "--max-blocks-per-tenant": _integer(1, 1 << 22),
    "--quantization": _one_of("int8", "fp8"), "--seed": _integer(0, 2**63 - 1),
    "--log-level": _one_of("critical", "error", "warning", "info", "debug"),
    "--header-timeout-s": _seconds(3600), "--body-timeout-s": _seconds(3600),
    "--gpu-memory-utilization": _fraction, "--kv-cache-dtype": _one_of("auto", "fp8"),
}
FAULT_FLAGS: dict[str, bool] = {"--fault-latency-ms": True, "--fault-token-latency-ms": True,
                                "--fault-error-rate": True}
# what the deployer sets itself (named in the error, so the operator learns why rather than "unknown")
DEPLOYER_FLAGS = frozenset({"--host", "--port", "--listen-fd", "--env", "--service", "--model", "--kernels", "--otel-exporter",
                            "--otlp-endpoint", "--tensor-parallel-size", *FAULT_FLAGS})
# the deployer's flags a rollout sets through a field of its own (named in the refusal)
FIELD_OF_FLAG = {"--model": "model", "--kernels": "kernels", "--tensor-parallel-size": "tensor_parallel_size"}
_TAKES_VALUE = {**OPERATOR_FLAGS, **FAULT_FLAGS}
MAX_ARGS = 64
MAX_ARG_CHARS = 256
# environment the deployer owns or that changes what code runs or where it connects: SITS_* (env/service labels,
# build, plugins), OTEL_* (where traces go), the loader's, the C library's and the interpreters', Triton's (its
# interpreter and cache), proxies and TLS trust
_ENV_REFUSED_PREFIXES = ("SITS_", "OTEL_", "LD_", "PYTHON", "DYLD_", "GLIBC_", "MALLOC_", "TRITON_", "SSL_",
                         "REQUESTS_CA", "CURL_CA")
_ENV_REFUSED = frozenset({"PATH", "BASH_ENV", "ENV", "SHELLOPTS", "IFS", "HOME", "TMPDIR", "HTTP_PROXY",
                          "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "CUDA_VISIBLE_DEVICES"})
MAX_ENV = 64
MAX_ENV_NAME = 128


def _printable(s: str) -> bool:
    return s.isprintable()   # False for NUL and other control characters, and for lone surrogates


def check_args(args: Iterable[str], field: str, allowed: dict[str, bool] = OPERATOR_FLAGS) -> tuple[str, ...]:
    """`args` as a tuple if every flag is in `allowed` (with its value where it takes one), else ValidationError
    naming the field and the flag."""
    if isinstance(args, (str, bytes)) or not all(isinstance(a, str) for a in args):
        raise ValidationError(f"{field} must be a list of strings", field)
    out = tuple(args)
    if len(out) > MAX_ARGS:
        raise ValidationError(f"{field}: at most {MAX_ARGS} arguments, got {len(out)}", field)
    i = 0
    while i < len(out):
        a = out[i]
        if len(a) > MAX_ARG_CHARS or not _printable(a):
            raise ValidationError(f"{field}: argument {i} must be at most {MAX_ARG_CHARS} printable characters",
                                  field)
        name, eq, value = a.partition("=")
        if name in DEPLOYER_FLAGS and name not in allowed:
            use = f" (the rollout's {FIELD_OF_FLAG[name]} sets it)" if name in FIELD_OF_FLAG else ""
            raise ValidationError(f"{field}: {name} is set by the deployer and cannot be given{use}", field)
        if name not in allowed:
            raise ValidationError(f"{field}: {name[:60]!r} is not an engine flag a rollout may set; allowed: "
                                  f"{', '.join(sorted(allowed))}", field)
        takes = allowed[name]
        if not takes and eq:
            raise ValidationError(f"{field}: {name} takes no value", field)
        if takes and not eq:
            if i + 1 >= len(out) or (out[i + 1].startswith("-") and not _number(out[i + 1])):
                raise ValidationError(f"{field}: {name} needs a value", field)
            value, i = out[i + 1], i + 1
            if len(value) > MAX_ARG_CHARS or not _printable(value):
                raise ValidationError(f"{field}: the value of {name} must be at most {MAX_ARG_CHARS} printable "
                                      "characters", field)
        if takes and not value:
            raise ValidationError(f"{field}: {name} needs a value", field)
        problem = FLAG_VALUES[name](value) if takes and name in FLAG_VALUES else None
        if problem:
            raise ValidationError(f"{field}: {name} {problem}, got {value[:40]!r}", field)
        i += 1
    return out


def _groups(args: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """Checked `args` split into (flag, its tokens): `--flag V`, `--flag=V` or `--flag` alone."""
    out, i = [], 0
    while i < len(args):
        name, eq, _ = args[i].partition("=")
        n = 2 if not eq and _TAKES_VALUE.get(name, False) and i + 1 < len(args) else 1
        out.append((name, tuple(args[i:i + n])))
        i += n
    return out


def flag_map(args: Sequence[str]) -> dict[str, str | None]:
    """Checked `args` as flag -> value (`--flag V` or `--flag=V`; None for a flag that takes none); a repeated flag
    keeps its last value, as argparse does."""
    out: dict[str, str | None] = {}
    for name, tokens in _groups(args):
        out[name] = tokens[1] if len(tokens) == 2 else (tokens[0].partition("=")[2] if "=" in tokens[0] else None)
    return out


def with_flags(args: Sequence[str], extra: Sequence[str]) -> tuple[str, ...]:
    """`args` with `extra`'s flags set: every flag `extra` gives is taken out of `args` (with its value), then
    `extra` follows, so a flag never appears twice (`--kv-cache-dtype fp8` over args that already set it)."""
    given = {name for name, _ in _groups(extra)}
    return (*(t for name, tokens in _groups(args) if name not in given for t in tokens), *extra)


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value checked `args` give `flag`, or None."""
    return flag_map(args).get(flag)


def flag_changes(production_args: Sequence[str], canary_args: Sequence[str]) -> list[str]:
    """What the canary's engine flags change from production's, one line each: `--kv-cache-dtype fp8` (production does
    not set it), `--quantization fp8 (production: int8)`, `--enforce-eager (production only)`."""
    prod, canary = flag_map(production_args), flag_map(canary_args)
    lines = []
    for name in sorted(set(prod) | set(canary)):
        if name not in canary:
            lines.append(" ".join(x for x in (name, prod[name]) if x is not None) + " (production only)")
        elif name not in prod:
            lines.append(" ".join(x for x in (name, canary[name]) if x is not None))
        elif prod[name] != canary[name]:
            lines.append(f"{name} {canary[name]} (production: {prod[name]})")
    return lines


def split_stored(args, faults: list[str] | None) -> tuple[list[str], list[str]]:
    """A stored args list (from before the allow-list) as (allowed, dropped): allowed flags with their values are
    kept; fault flags with their values go to `faults` when it is given (the canary's), else are dropped; every other
    argument is dropped."""
    args = [a for a in args if isinstance(a, str)]
    kept, dropped, i = [], [], 0
    while i < len(args):
        name, eq, _ = args[i].partition("=")
        known = {**OPERATOR_FLAGS, **FAULT_FLAGS}
        takes = known.get(name, False)
        n = 2 if takes and not eq and i + 1 < len(args) else 1
        group = args[i:i + n]
        if name in OPERATOR_FLAGS:
            target = kept
        elif name in FAULT_FLAGS and faults is not None:
            target = faults
        else:
            target = dropped
        target.extend(group)
        i += n
    try:   # what the allow-list still refuses (a bad value, a control character) is dropped as a whole
        check_args(kept, "args")
    except ValidationError:
        dropped, kept = dropped + kept, []
    return kept, dropped


def check_env(env: dict[str, str], field: str = "env") -> dict[str, str]:
    """`env` unless it sets a variable the deployer owns or one that changes what code runs (ValidationError)."""
    if len(env) > MAX_ENV:
        raise ValidationError(f"{field}: at most {MAX_ENV} variables", field)
    for k, val in env.items():
        if not k or len(k) > MAX_ENV_NAME or not (k.replace("_", "a").isalnum() and k.isascii()) or k[0].isdigit():
            raise ValidationError(f"{field}: {k[:60]!r} is not a variable name (letters, digits, '_'; at most "
                                  f"{MAX_ENV_NAME} characters)", field)
        if k.upper() in _ENV_REFUSED or k.upper().startswith(_ENV_REFUSED_PREFIXES):
            raise ValidationError(f"{field}: {k} is set by the deployer and cannot be given", field)
        if len(val) > 4096 or not _printable(val):
            raise ValidationError(f"{field}: the value of {k} must be at most 4096 printable characters", field)
    return env


def _number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True
