"""``python -m tl_geometry``: the ``tl-geometry`` command (also under ``torchrun -m tl_geometry``)."""

import sys

from tl_geometry.cli import main

if __name__ == "__main__":
    sys.exit(main())
