"""Stand-ins for the outside world, for the demo, the tests and the benches: a generated GDELT
mirror and its HTTP server, news sites, hostile GDELT files, a SeaweedFS S3 server, a generated
event database, and the demo that runs the whole chain through Dagster on them.

Not part of the library: the Docker image (deploy/Dockerfile) does not ship it, and pipeline/
never imports it but for the CLI's `mirai demo`/`mirai mirror` commands, which load it when run
and say so when it is absent (tests/test_deploy.py, tests/test_cli.py)."""
