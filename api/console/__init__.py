"""The operator console at ``/console`` (``CARMY_CONSOLE``): server-rendered pages for a person
on call, over the same calling room as ``/agent/*``, with a sign-in of its own (a browser cannot
send the API's bearer header by itself). The top room of the API: it may import every other.
"""
