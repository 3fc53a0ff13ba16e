package main

import (
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hybridrate/hybridrate/sidecar"
)

// upstreamMetrics exports, beside hybridrate's own metrics, envoyproxy/ratelimit's statistics under
// the names and labels its Prometheus sink gives them (its statsd mapping,
// src/stats/prom/default_mapper.yaml): ratelimit_service_rate_limit_{total_hits,over_limit,
// near_limit,within_limit,shadow_mode} with labels domain and key1 (a stats key of two parts) or
// domain, key1 and key2 (three or more parts; the rest is dropped, as upstream's mapping drops it);
// ratelimit_service_config_load_success and _error; and, unmapped as upstream leaves it,
// ratelimit_service_rate_limit_<domain>_domain_not_found. As upstream's sink, a counter appears once
// it is above 0. It is an unchecked collector: one name carries two label sets, as upstream's does.
type upstreamMetrics struct {
	stats            *sidecar.UpstreamStats
	loadOK, loadFail atomic.Uint64
}

// upstreamLimitMetrics are the per-limit counters, by their names.
var upstreamLimitMetrics = []struct {
	name  string
	value func(*sidecar.LimitStats) uint64
}{
	{"ratelimit_service_rate_limit_total_hits", func(l *sidecar.LimitStats) uint64 { return l.TotalHits.Load() }},
	{"ratelimit_service_rate_limit_over_limit", func(l *sidecar.LimitStats) uint64 { return l.OverLimit.Load() }},
	{"ratelimit_service_rate_limit_near_limit", func(l *sidecar.LimitStats) uint64 { return l.NearLimit.Load() }},
	{"ratelimit_service_rate_limit_within_limit", func(l *sidecar.LimitStats) uint64 { return l.WithinLimit.Load() }},
	{"ratelimit_service_rate_limit_shadow_mode", func(l *sidecar.LimitStats) uint64 { return l.ShadowMode.Load() }},
}

// Describe sends nothing: the collector is unchecked.
func (u *upstreamMetrics) Describe(chan<- *prometheus.Desc) {}

// Collect sends every counter above 0.
func (u *upstreamMetrics) Collect(ch chan<- prometheus.Metric) {
	send := func(name string, v uint64, names, values []string) {
		if v == 0 {
			return
		}
		m, err := prometheus.NewConstMetric(prometheus.NewDesc(name, "envoyproxy/ratelimit's statistic "+name, names, nil),
			prometheus.CounterValue, float64(v), values...)
		if err == nil {
			ch <- m
		}
	}
	send("ratelimit_service_config_load_success", u.loadOK.Load(), nil, nil)
	send("ratelimit_service_config_load_error", u.loadFail.Load(), nil, nil)
	two, three := []string{"domain", "key1"}, []string{"domain", "key1", "key2"}
	u.stats.Range(func(key string, l *sidecar.LimitStats) bool {
		parts := strings.Split(strings.ToValidUTF8(sanitizeStatName(key), "_"), ".")
		names := three
		switch {
		case len(parts) < 2:
			return true
		case len(parts) == 2:
			names = two
		default:
			parts = parts[:3]
		}
		for _, m := range upstreamLimitMetrics {
			send(m.name, m.value(l), names, parts)
		}
		return true
	})
	u.stats.RangeDomainNotFound(func(domain string, n uint64) bool {
		send(escapeMetricName("ratelimit_service_rate_limit_"+sanitizeStatName(domain)+"_domain_not_found"), n, nil, nil)
		return true
	})
}

// ipv4 is upstream's pattern of an IPv4 address in a stats key.
var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// sanitizeStatName is upstream's SanitizeStatName: ':' and '|' become '_', and so do the dots of
// IPv4 addresses.
func sanitizeStatName(s string) string {
	s = strings.NewReplacer(":", "_", "|", "_").Replace(s)
	return ipv4.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}

// escapeMetricName makes an unmapped statsd name a Prometheus name as upstream's statsd exporter
// does: every character other than [A-Za-z0-9_] becomes '_', and a leading digit gets a '_' first.
func escapeMetricName(s string) string {
	var b strings.Builder
	if s != "" && s[0] >= '0' && s[0] <= '9' {
		b.WriteByte('_')
	}
	for _, c := range s {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}
