"""The edges: the TCP protocol V2 server and the HTTP API server, and what they share."""
