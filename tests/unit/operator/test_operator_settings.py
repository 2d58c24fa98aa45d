"""kopf's settings as the operator runs it: no call to the API server without a bound."""

from __future__ import annotations

import kopf

from headrace.operator import handlers


def test_every_watch_and_request_has_a_timeout() -> None:
    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    watching, networking = settings.watching, settings.networking
    # kopf's defaults leave watches open as long as the server likes and connects unbounded
    assert watching.server_timeout is not None and watching.server_timeout > 0
    assert watching.client_timeout is not None
    assert watching.client_timeout > watching.server_timeout  # the server ends it first
    assert watching.connect_timeout is not None and networking.connect_timeout is not None
    assert networking.request_timeout is not None
