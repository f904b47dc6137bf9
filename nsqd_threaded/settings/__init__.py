"""Options, the flag/config-file table, and TOML loading."""
