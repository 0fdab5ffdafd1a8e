"""What epycd tells Prometheus (docs/metrics.md).

`scrape` reads each instance's own vLLM `/metrics` on the address it listens on, in
parallel and bounded, and labels its series with the endpoint, instance, socket and NUMA
node; `series` turns the endpoints' status and approved plans into epycd's own series;
`load` keeps the last minute of each endpoint's load for `epycctl status NAME`; `server`
serves both at `metrics_listen`, scraping the instances when Prometheus asks and never
in between.
"""
