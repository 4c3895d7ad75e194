"""The HTTP API, one module per family of endpoints; `fairlane.server` assembles them."""
