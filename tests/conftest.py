"""The tests run with the server's own thread settings (fairlane.runtime.host), as `fairlane serve`
does: set before any engine's native library is imported."""

from fairlane.runtime import host

host.configure()
