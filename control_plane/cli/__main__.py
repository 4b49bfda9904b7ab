"""`python -m control_plane.cli ...` is `sits-control ...`."""
import sys

from control_plane.cli.main import main

sys.exit(main())
