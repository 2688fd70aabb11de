"""An existing HTTP API as agent tools: each operation of an OpenAPI 3.0 or 3.1 document becomes
a tool that calls it (README, "Serve an existing API").

```python
from carmy_worker import Toolbox
from carmy_worker.openapi import bearer

tools = Toolbox()
tools.openapi("petstore.yaml", base_url="https://petstore.example/v1", prefix="pets_",
              auth=bearer("PETSTORE_TOKEN"))
```

The package, one concept a module: ``document`` (read, validate, resolve references),
``operations`` and ``naming`` (an operation as a tool), ``schemas`` (OpenAPI schemas as JSON
Schema), ``params`` (parameters on the wire, the URL), ``upstream`` and ``client`` (the call),
``failures`` (the upstream's errors as the protocol's), ``auth`` (credentials from the
environment), ``importer`` (the tools registered).
"""

from carmy_worker.openapi.auth import Auth, AuthError, api_key_header, api_key_query, basic, bearer
from carmy_worker.openapi.document import OpenAPIError
from carmy_worker.openapi.importer import Options, register

__all__ = ["Auth", "AuthError", "OpenAPIError", "Options", "api_key_header", "api_key_query", "basic", "bearer",
           "register"]
