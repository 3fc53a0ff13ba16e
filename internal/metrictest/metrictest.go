// Package metrictest reads, in tests, the OpenTelemetry metrics that the code under test records: a
// meter provider backed by a manual reader ([New]), and the points of one instrument
// ([Reader.Sum], [Reader.Point], [Reader.HistogramCount]).
package metrictest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Reader is a meter provider and the manual reader it exports to. Give Provider to the code under
// test (a WithMeterProvider option), then read what it recorded with Reader's methods; each method
// collects afresh. A Reader is safe for concurrent use.
type Reader struct {
	Provider *sdkmetric.MeterProvider
	manual   *sdkmetric.ManualReader
}

// New returns a Reader whose provider is shut down in tb.Cleanup.
func New(tb testing.TB) *Reader {
	tb.Helper()
	manual := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(manual))
	tb.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &Reader{Provider: mp, manual: manual}
}

// Metrics collects and returns the metrics named name, of every scope; every metric for an empty
// name. A failed collection fails tb.
func (r *Reader) Metrics(tb testing.TB, name string) []metricdata.Metrics {
	tb.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.manual.Collect(context.Background(), &rm); err != nil {
		tb.Fatalf("collect metrics: %v", err)
	}
	var out []metricdata.Metrics
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if name == "" || m.Name == name {
				out = append(out, m)
			}
		}
	}
	return out
}

// Points returns the data points of the int64 sums and gauges named name whose attributes include
// every attribute of want, with its value.
func (r *Reader) Points(tb testing.TB, name string, want ...attribute.KeyValue) []metricdata.DataPoint[int64] {
	tb.Helper()
	var out []metricdata.DataPoint[int64]
	for _, m := range r.Metrics(tb, name) {
		var dps []metricdata.DataPoint[int64]
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			dps = d.DataPoints
		case metricdata.Gauge[int64]:
			dps = d.DataPoints
		}
		for _, dp := range dps {
			if HasAll(dp.Attributes, want) {
				out = append(out, dp)
			}
		}
	}
	return out
}

// Sum returns the sum of the values of [Reader.Points]: zero when none matches.
func (r *Reader) Sum(tb testing.TB, name string, want ...attribute.KeyValue) int64 {
	tb.Helper()
	var total int64
	for _, dp := range r.Points(tb, name, want...) {
		total += dp.Value
	}
	return total
}

// Point returns the value and attributes of the first of [Reader.Points]; it fails tb when none
// matches.
func (r *Reader) Point(tb testing.TB, name string, want ...attribute.KeyValue) (int64, attribute.Set) {
	tb.Helper()
	dps := r.Points(tb, name, want...)
	if len(dps) == 0 {
		tb.Fatalf("no data point of %s with %v", name, want)
		return 0, attribute.Set{}
	}
	return dps[0].Value, dps[0].Attributes
}

// HistogramCount returns the number of recordings of the float64 histograms named name whose
// attributes include want.
func (r *Reader) HistogramCount(tb testing.TB, name string, want ...attribute.KeyValue) uint64 {
	tb.Helper()
	var n uint64
	for _, m := range r.Metrics(tb, name) {
		h, ok := m.Data.(metricdata.Histogram[float64])
		if !ok {
			continue
		}
		for _, dp := range h.DataPoints {
			if HasAll(dp.Attributes, want) {
				n += dp.Count
			}
		}
	}
	return n
}

// HasAll reports whether attrs holds every attribute of want, with its value.
func HasAll(attrs attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := attrs.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}
