"""Tests of the documentation: links between pages."""
