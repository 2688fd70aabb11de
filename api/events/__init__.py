"""An API process's events from Redis: one subscription per process (``hub``), whose messages go
to a bounded mailbox per execution followed (``mailbox``)."""
