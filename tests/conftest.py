import os
import sys

# Tests import their shared helpers (e.g. the independent oracle) as top-level modules.
sys.path.insert(0, os.path.dirname(__file__))
