"""Domain metrics: what each kind's status says, exported at scrape time from the informers'
caches (no API or etcd call per scrape), and the same facts for ``kubectl kustos status``."""
