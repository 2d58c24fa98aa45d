"""The wire protocol: frames and message bodies (pure, no sockets)."""
