"""The broker core, one module per concept of Go's nsqd package: NSQD, Topic, Channel, Client."""
