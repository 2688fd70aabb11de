"""What every room of the API reads and answers with: a request's header fields, and carmy/1
error envelopes. The lowest room after ``settings``: it imports no other."""
