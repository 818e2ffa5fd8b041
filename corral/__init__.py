"""corral: a multi-tenant batch job system.

This package holds the `corral` command line and the Python code generated
from corral's protobuf contracts (`corral.<api>.v1`); the client will be
exported from here.
"""

__version__ = "0.1.0"
