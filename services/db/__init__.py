"""corral's data layer: the pool, procedure calls, migrations and invariants.

Importing it registers what its errors mean to a caller (services.db.request_errors) with
services.common.errors: whichever module raises a procedure's error, the service's interceptor then
answers with its status. (The registration, rather than common importing this package: common is the
lower layer, and this one depends on it.)
"""

from services.common.errors import register_translation
from services.db.request_errors import request_error

register_translation(request_error)
