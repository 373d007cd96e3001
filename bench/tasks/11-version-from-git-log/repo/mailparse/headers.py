"""Header parsing."""


def parse_headers(text: str) -> dict[str, str]:
    """Parse 'Name: value' lines up to the first blank line; names are lower-cased."""
    headers: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers
