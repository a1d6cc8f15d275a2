"""Node exporter benchmarks and its standalone runner (development only)."""
