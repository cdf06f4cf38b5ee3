"""Reading a replica's ``GET /metrics`` in tests: sample name and labels to value."""

from __future__ import annotations

import httpx2
from prometheus_client.parser import text_string_to_metric_families


class Scrape(dict[str, float]):
    """One scrape: ``scrape["tether_turns_completed_total"]``, or with labels
    ``scrape['tether_store_operation_seconds_count{backend="sqlite",...}']``."""

    def value(self, name: str, **labels: str) -> float:
        """The sum over every sample of ``name`` whose labels include ``labels``."""
        total = 0.0
        for key, value in self.items():
            sample, _, rest = key.partition("{")
            if sample != name:
                continue
            if all(f'{label}="{wanted}"' in rest for label, wanted in labels.items()):
                total += value
        return total


def scrape(base_url: str) -> Scrape:
    response = httpx2.get(f"{base_url}/metrics", timeout=5)
    response.raise_for_status()
    assert response.headers["content-type"].startswith("text/plain")
    result = Scrape()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            result[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return result


def moved(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    """How far a counter moved between two scrapes."""
    return after.value(name, **labels) - before.value(name, **labels)
