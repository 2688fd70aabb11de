"""Tests against a real local Redis Cluster (``bench/localcluster.py``): marked ``cluster`` and
``e2e`` by this folder's conftest, so the quick loop leaves them out."""
