"""What every layer above may use: Go compatibility, the log format, a small HTTP client."""
