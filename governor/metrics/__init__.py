"""Prometheus metrics of the governed slices (issue 13): the collector (collector.py), the
/metrics endpoint of `governor launch/monitor --metrics` and the node_exporter textfile of
`governor metrics --textfile` (export.py). Only listen.py is standard library: the lean launch
path imports prometheus_client (through export.py) when --metrics is given, never otherwise.
"""
