"""`python -m sits.control_plane.cli ...` is `sits-control ...`."""
import sys

from sits.control_plane.cli.main import main

sys.exit(main())
