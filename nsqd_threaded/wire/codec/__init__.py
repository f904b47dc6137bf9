"""Stream codecs for the TCP protocol's IDENTIFY upgrades (snappy; deflate is zlib's)."""
