//! What the simulated runtime's registry has. The simulator pulls nothing; it answers a pull
//! as the registry would: an image of Docker Hub's `library` namespace (a bare name such
//! as `nginx` or `webserver`) exists only if it is one of Docker Hub's official images, so a
//! typo or a made-up name fails with ErrImagePull as containerd reports it. Images of any
//! other registry or namespace are taken to exist (the simulator cannot know them).

/// Docker Hub's official images (the `library` namespace).
const OFFICIAL: &[&str] = &[
    "adminer",
    "aerospike",
    "almalinux",
    "alpine",
    "alt",
    "amazoncorretto",
    "amazonlinux",
    "api-firewall",
    "arangodb",
    "archlinux",
    "backdrop",
    "bash",
    "bonita",
    "buildpack-deps",
    "busybox",
    "caddy",
    "cassandra",
    "centos",
    "chronograf",
    "cirros",
    "clearlinux",
    "clickhouse",
    "clojure",
    "composer",
    "consul",
    "convertigo",
    "couchbase",
    "couchdb",
    "crate",
    "dart",
    "debian",
    "docker",
    "drupal",
    "eclipse-mosquitto",
    "eclipse-temurin",
    "eggdrop",
    "elasticsearch",
    "elixir",
    "emqx",
    "erlang",
    "fedora",
    "flink",
    "fluentd",
    "friendica",
    "gazebo",
    "gcc",
    "geonetwork",
    "ghost",
    "golang",
    "gradle",
    "groovy",
    "haproxy",
    "haskell",
    "haxe",
    "hello-world",
    "hitch",
    "httpd",
    "hylang",
    "ibm-semeru-runtimes",
    "ibmjava",
    "influxdb",
    "irssi",
    "jetty",
    "joomla",
    "jruby",
    "julia",
    "kapacitor",
    "kibana",
    "kong",
    "krakend",
    "liquibase",
    "logstash",
    "mageia",
    "mariadb",
    "matomo",
    "maven",
    "mediawiki",
    "memcached",
    "mongo",
    "mongo-express",
    "monica",
    "mono",
    "mysql",
    "nats",
    "neo4j",
    "neurodebian",
    "nextcloud",
    "nginx",
    "node",
    "notary",
    "odoo",
    "open-liberty",
    "openjdk",
    "oraclelinux",
    "orientdb",
    "percona",
    "perl",
    "photon",
    "php",
    "phpmyadmin",
    "plone",
    "postfixadmin",
    "postgres",
    "pypy",
    "python",
    "r-base",
    "rabbitmq",
    "rakudo-star",
    "redis",
    "redmine",
    "registry",
    "rethinkdb",
    "rocket.chat",
    "rockylinux",
    "ros",
    "ruby",
    "rust",
    "sapmachine",
    "satosa",
    "silverpeas",
    "solr",
    "sonarqube",
    "spark",
    "spiped",
    "storm",
    "swift",
    "swipl",
    "teamspeak",
    "telegraf",
    "tomcat",
    "tomee",
    "traefik",
    "ubuntu",
    "unit",
    "varnish",
    "websphere-liberty",
    "wordpress",
    "xwiki",
    "yourls",
    "znc",
    "zookeeper",
];

/// The reference containerd resolves `image` to: `docker.io/library/nginx:latest` for
/// `nginx`, `docker.io/bitnami/redis:7` for `bitnami/redis:7`.
pub fn normalize(image: &str) -> String {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let first = name.split('/').next().unwrap_or("");
    let has_registry =
        name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut full = if has_registry {
        name.to_owned()
    } else if name.contains('/') {
        format!("docker.io/{name}")
    } else {
        format!("docker.io/library/{name}")
    };
    let last = full.rsplit('/').next().unwrap_or("");
    if digest.is_none() && !last.contains(':') {
        full.push_str(":latest");
    }
    if let Some(d) = digest {
        full.push('@');
        full.push_str(d);
    }
    full
}

/// Why pulling `image` fails, when the simulated registry does not have it.
pub fn missing(image: &str) -> Option<String> {
    let full = normalize(image);
    let repo = full.split(['@']).next().unwrap_or(&full);
    let repo = match repo.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') => r,
        _ => repo,
    };
    let name = repo.strip_prefix("docker.io/library/")?;
    if OFFICIAL.contains(&name) {
        return None;
    }
    Some(format!(
        "failed to resolve reference \"{full}\": pull access denied, repository does not exist or may require authorization: server message: insufficient_scope: authorization failed"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_normalized_as_containerd_does() {
        assert_eq!(normalize("nginx"), "docker.io/library/nginx:latest");
        assert_eq!(
            normalize("webserver:404"),
            "docker.io/library/webserver:404"
        );
        assert_eq!(normalize("bitnami/redis:7"), "docker.io/bitnami/redis:7");
        assert_eq!(
            normalize("registry.k8s.io/pause:3.10"),
            "registry.k8s.io/pause:3.10"
        );
        assert_eq!(normalize("localhost:5000/x"), "localhost:5000/x:latest");
    }

    #[test]
    fn only_unknown_official_names_are_missing() {
        assert!(missing("webserver:404").is_some());
        assert!(missing("ngnix").is_some());
        assert!(missing("nginx:1.29").is_none());
        assert!(missing("python:3.12").is_none());
        assert!(missing("registry.k8s.io/e2e-test-images/agnhost:2.66").is_none());
        assert!(missing("someone/tool").is_none());
        let (list, mut sorted) = (OFFICIAL.to_vec(), OFFICIAL.to_vec());
        sorted.sort_unstable();
        assert_eq!(list, sorted);
    }
}
