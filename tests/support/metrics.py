"""Reading an exposition as Prometheus does: each sample by its name and labels."""

from prometheus_client.parser import text_string_to_metric_families


def parse(text):
    """{(sample name, frozenset of label items): value} and {family name: type}."""
    values, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            values[(s.name, frozenset(s.labels.items()))] = s.value
    return values, types


def value(values, name, **labels):
    return values[(name, frozenset(labels.items()))]


def scrape(h):
    """The exposition of the daemon of ``h`` (a Harness), as a scrape reads it."""
    from prometheus_client import generate_latest

    from noded.loop.metrics import make_registry

    return generate_latest(make_registry(h.daemon)).decode()
