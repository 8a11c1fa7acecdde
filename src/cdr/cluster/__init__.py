"""The sharded backend: a knowledge base split into CKF shards, each served by a Ray actor.

`shardset` lays the shards out on disk, `shard_server` is what one shard does (plain Python,
testable without a cluster), `ray_index` serves them as one `FactIndex`, `shard_merge` merges
their ranked candidates, and `ray_ingest` embeds on the cluster's actors.
"""
