"""The dashboard in a real headless browser against a real local cluster.

Playwright drives Debian's chromium (browser downloads do not work here), so the
assertions are on what a person sees: the page fills itself in, a chart gains
points after producing, and after a kill -9 the broker shows as down within the
liveness TTL, its partition turns Offline and red, and a replicated one amber
(under-replicated). Screenshots are kept in ``test-artifacts/`` (git-ignored);
the path is printed.

Without chromium or playwright this test fails and says how to install them:
`.ci/run` installs both, so a skip would only hide a broken CI machine.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.cli import local_cluster
from headrace.control.settings import ControlSettings
from tests.integration.localcluster import LocalCluster, topic_manifest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TOPIC = "dash"
PARTITIONS = 3
MIRRORED = "mirrored"
#: The page shows a dead broker as down once the controller's liveness TTL has run out
#: (plus a page poll). The wait's deadline is generous so that a loaded CI machine does
#: not turn a correct page into a failure; the time is a figure for the bench, not a test.
DOWN_DEADLINE_MS = ControlSettings().liveness_ttl_ms + 15_000


@pytest.fixture
def playwright() -> Any:
    """Playwright's sync API, checked before a cluster is started for nothing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[dev]' (the dev extra has it)")
    if not CHROMIUM.exists():
        pytest.fail(f"no chromium at {CHROMIUM}: apt-get install -y chromium (.ci/run does)")
    return sync_playwright


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "local")
    c.up()
    try:
        yield c
    finally:
        c.down()


def _red(rgb: str) -> bool:
    """A CSS ``rgb(r, g, b)`` colour whose red clearly dominates."""
    r, g, b = (int(x) for x in re.findall(r"\d+", rgb)[:3])
    return r > g + 20 and r > b + 20


def _amber(rgb: str) -> bool:
    """A CSS ``rgb(r, g, b)`` colour of yellow-orange: red and green well above blue."""
    r, g, b = (int(x) for x in re.findall(r"\d+", rgb)[:3])
    return r > b + 40 and g > b + 40


def test_dashboard_shows_a_killed_broker_down_its_partition_offline_and_charts(
    playwright: Any, cluster: LocalCluster
) -> None:
    # One replica per partition: the killed broker's partition has nobody to fail over to.
    assert (
        cluster.apply(topic_manifest(TOPIC, PARTITIONS, replicas=1, min_in_sync=1)).returncode == 0
    )
    # Three replicas each: when a broker dies these stay online, with one replica fewer.
    assert cluster.apply(topic_manifest(MIRRORED, 1, replicas=3, min_in_sync=1)).returncode == 0
    cluster.wait(
        lambda: (
            [p["state"] for p in cluster.partitions(f"default/{TOPIC}")] == ["Online"] * 3
            and [p["state"] for p in cluster.partitions(f"default/{MIRRORED}")] == ["Online"]
        ),
        what="the topics online",
    )
    from playwright.sync_api import expect

    with playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(cluster.controller_url + "/")
            brokers = page.locator("#brokers tbody tr")
            expect(brokers).to_have_count(3, timeout=20_000)
            expect(page.locator("#brokers td.health")).to_have_text(["up"] * 3, timeout=20_000)
            # the test's topics' rows (local up also applies the Kafka groups' offsets topic)
            ours = page.locator("#partitions tbody tr").filter(
                has_not_text=local_cluster.KAFKA_OFFSETS_TOPIC
            )
            expect(ours).to_have_count(PARTITIONS + 1)
            expect(page.locator("#problems li")).to_have_text(["No problems."])
            expect(page.locator("#connection")).to_have_text(re.compile("^live"))

            # Charts gain points: producing raises the produce line above zero, consuming
            # (in two rounds, so that the cohort's cursors were sampled before) the consume line.
            records = b"".join(b"k%d:event-%d\n" % (i, i) for i in range(300))
            cluster.cli(
                "produce",
                TOPIC,
                "--acks",
                "all",
                "--key-sep",
                ":",
                "--bootstrap",
                cluster.bootstrap,
                stdin=records,
            )
            page.wait_for_function(
                "Number(document.getElementById('chart-produce').dataset.nonzero) > 0",
                timeout=20_000,
            )
            expect(
                page.locator('#chart-produce polyline[data-series="default/dash"]')
            ).to_have_count(1)
            consume = ("consume", TOPIC, "--cohort", "readers", "--from-beginning")
            cluster.cli(*consume, "--count", "60", "--bootstrap", cluster.bootstrap)
            cohort = page.locator("#cohorts h3")
            expect(cohort).to_contain_text(["readers on default/dash — lag 240"], timeout=20_000)
            cluster.cli(*consume, "--count", "60", "--bootstrap", cluster.bootstrap)
            # the cohort took 120 of 300: the page shows the lag in total and per partition
            expect(cohort).to_contain_text(["lag 180"], timeout=20_000)
            page.wait_for_function(
                "Number(document.getElementById('chart-consume').dataset.nonzero) > 0",
                timeout=20_000,
            )
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard-healthy.png"), full_page=True)

            # kill -9 the leader of partition 0
            victim = cluster.partitions(f"default/{TOPIC}")[0]["leader"]
            cluster.kill_broker(victim)
            health = page.locator(f'#brokers tr[data-broker="{victim}"] td.health')
            expect(health).to_have_text("down", timeout=DOWN_DEADLINE_MS)

            row = page.locator(f'#partitions tr[data-partition="default/{TOPIC}/0"]')
            expect(row).to_have_class(re.compile(r"\boffline\b"), timeout=20_000)
            expect(row.locator("td.state")).to_have_text(re.compile("^Offline"))
            background = row.locator("td").first.evaluate(
                "el => getComputedStyle(el).backgroundColor"
            )
            assert _red(background), f"an offline row is red, not {background}"
            expect(page.locator("#problems li").first).to_have_text(
                re.compile(f"^Broker {victim} .* is down")
            )
            expect(page.locator("#health-pill")).to_have_text(re.compile("problem"))
            # the replicated partition stays online without the victim: amber, not red
            mirrored = page.locator(f'#partitions tr[data-partition="default/{MIRRORED}/0"]')
            expect(mirrored).to_have_class(re.compile(r"\bunder-replicated\b"), timeout=30_000)
            expect(mirrored.locator("td.state")).to_have_text("Online · under-replicated")
            amber = mirrored.locator("td").first.evaluate(
                "el => getComputedStyle(el).backgroundColor"
            )
            assert _amber(amber), f"an under-replicated row is amber, not {amber}"

            shot = ARTIFACTS / "dashboard-broker-down.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"dashboard screenshot: {shot}")
            assert errors == [], "the page logged errors"
        finally:
            browser.close()
