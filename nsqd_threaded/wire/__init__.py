"""The wire formats shared by the server and the client: frames, commands, the message record, transports, codecs."""
