"""How ``python -m api`` serves the app: uvicorn's settings and a hardened httptools protocol
(``server``: header and body deadlines, the header size limit, the absolute-form Host), with a
half-close told from a hang-up (``halfclose``), a request's ``Departure`` set as its
connection is lost (``departure``), and a response's head written with its body (``onewrite``).
Under another ASGI server none of this runs (README, "Serving")."""
