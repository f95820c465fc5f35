"""The project's tests, in folders that mirror the product's rooms (tests/README.md)."""
