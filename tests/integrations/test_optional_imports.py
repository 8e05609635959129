"""The integrations are imported only when used (spec/queue.md Q-108).

Goal: ``import deferq`` keeps zero runtime dependencies loaded, and an integration without
its library says which extra to install. Method: fresh interpreters that list
``sys.modules`` after importing, and that block the library (``sys.modules[name] = None``
makes its import fail as an uninstalled one would).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
{setup}
print(json.dumps(sorted(m for m in sys.modules)))
"""


def _loaded(setup: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", PROBE.format(setup=setup)],
                            capture_output=True, text=True, timeout=60, check=True)
    loaded: list[str] = json.loads(result.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.slow
@pytest.mark.spec("Q-108")
def test_importing_deferq_imports_neither_library() -> None:
    loaded = _loaded("import deferq, deferq.integrations, deferq.backends")
    assert "deferq.integrations" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("prometheus_client", "opentelemetry")] == []
    # The probe sees them when they are imported.
    used = _loaded("import deferq.integrations.prometheus, deferq.integrations.otel")
    assert "prometheus_client" in used and "opentelemetry.trace" in used


@pytest.mark.slow
@pytest.mark.spec("Q-108")
@pytest.mark.parametrize(("module", "library", "extra"), [
    ("deferq.integrations.prometheus", "prometheus_client", "deferq[prometheus]"),
    ("deferq.integrations.otel", "opentelemetry", "deferq[otel]"),
])
def test_an_integration_without_its_library_names_the_extra(module: str, library: str,
                                                            extra: str) -> None:
    code = (f"import sys\nsys.modules[{library!r}] = None\n"
            f"try:\n    import {module}\nexcept ImportError as e:\n    print(e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == (f"{module} needs "
                                     f"{'prometheus-client' if 'prom' in library else 'opentelemetry-api'}"
                                     f": pip install '{extra}'")
