"""Where messages and metadata live on disk: backends, the disk queue, durable mode, nsqd.dat."""
