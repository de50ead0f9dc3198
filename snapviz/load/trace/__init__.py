"""Chrome traces: the bounded JSON stream, the decode into columns."""
