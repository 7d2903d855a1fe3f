//! kube-proxy's metrics (`/metrics` on 10249), with upstream's names, help, buckets and
//! labels for what the nftables mode measures: sync latencies (all, full, partial), the
//! last successful sync's time, and failed nftables transactions.

use std::fmt::Write;
use std::sync::Mutex;

/// The `ip_family` label of every series (the nftables mode here is IPv4 only).
const FAMILY: &str = "IPv4";

/// A Prometheus histogram with upstream's buckets for sync latencies (1 ms doubling to
/// about 16 s).
#[derive(Debug, Clone)]
struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn sync_buckets() -> Histogram {
        let bounds: Vec<f64> = (0..15).map(|i| 0.001 * 2f64.powi(i)).collect();
        Histogram {
            counts: vec![0; bounds.len()],
            bounds,
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} [ALPHA] {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{ip_family=\"{FAMILY}\",le=\"{b}\"}} {c}"
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{ip_family=\"{FAMILY}\",le=\"+Inf\"}} {}",
            self.count
        );
        let _ = writeln!(out, "{name}_sum{{ip_family=\"{FAMILY}\"}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{ip_family=\"{FAMILY}\"}} {}", self.count);
    }
}

#[derive(Debug)]
struct Inner {
    all: Histogram,
    full: Histogram,
    partial: Histogram,
    last_success: f64,
    failures: u64,
}

/// One proxy's metrics.
#[derive(Debug)]
pub struct ProxyMetrics {
    inner: Mutex<Inner>,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        ProxyMetrics {
            inner: Mutex::new(Inner {
                all: Histogram::sync_buckets(),
                full: Histogram::sync_buckets(),
                partial: Histogram::sync_buckets(),
                last_success: 0.0,
                failures: 0,
            }),
        }
    }
}

impl ProxyMetrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A sync that worked, `full` or partial, taking `secs`.
    pub fn synced(&self, full: bool, secs: f64) {
        let mut m = self.lock();
        m.all.observe(secs);
        if full {
            m.full.observe(secs);
        } else {
            m.partial.observe(secs);
        }
        m.last_success = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
    }

    /// A failed nftables transaction.
    pub fn failed(&self) {
        self.lock().failures += 1;
    }

    /// The Prometheus text format.
    pub fn render(&self) -> String {
        let m = self.lock();
        let mut out = String::new();
        m.all.render(
            &mut out,
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
        );
        m.full.render(
            &mut out,
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
        );
        m.partial.render(
            &mut out,
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
        );
        let gauge = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
        let _ = writeln!(
            out,
            "# HELP {gauge} [ALPHA] The last time proxy rules were successfully synced"
        );
        let _ = writeln!(out, "# TYPE {gauge} gauge");
        let _ = writeln!(out, "{gauge}{{ip_family=\"{FAMILY}\"}} {}", m.last_success);
        let counter = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total";
        let _ = writeln!(
            out,
            "# HELP {counter} [ALPHA] Cumulative proxy nftables sync failures"
        );
        let _ = writeln!(out, "# TYPE {counter} counter");
        let _ = writeln!(out, "{counter}{{ip_family=\"{FAMILY}\"}} {}", m.failures);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_upstreams_series() {
        let m = ProxyMetrics::default();
        m.synced(true, 0.003);
        m.synced(false, 0.0005);
        m.failed();
        let text = m.render();
        assert!(text.contains(
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.001\"} 1"
        ));
        assert!(text.contains(
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"+Inf\"} 2"
        ));
        assert!(text.contains(
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1"
        ));
        assert!(text.contains(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"} 1"
        ));
    }
}
