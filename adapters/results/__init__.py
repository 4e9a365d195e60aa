"""Reading results back out of DuckDB: metrics, run comparison, reports and export."""
