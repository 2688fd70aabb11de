"""What a request must pass before any endpoint runs: the Host and Origin checks against browsers
(``browser``), API keys and OAuth access tokens (``auth``, ``oauth/``), the body's limit
(``body``), and the optional security and CORS headers (``headers``)."""
