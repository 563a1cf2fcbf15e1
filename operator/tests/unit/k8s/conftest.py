"""Makes the in-memory world of the stepper tests (stepper_world.py) importable by the tests next to it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
