package hybrid_test

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// gaugeReader is a MeterProvider that keeps the limiter's observable gauges and callbacks, so that
// tests can read the gauges: read() runs the callbacks and returns each gauge's observations by
// name, as "name{attr=value,...}" → value. Other instruments are no-ops.
type gaugeReader struct {
	noop.MeterProvider
	meter *gaugeMeter
}

type gaugeMeter struct {
	noop.Meter
	mu  sync.Mutex
	cbs []metric.Callback
}

type gauge struct {
	noop.Int64ObservableGauge
	name string
}

type gaugeObserver struct {
	noop.Observer
	got map[string]int64
}

func newGaugeReader() *gaugeReader { return &gaugeReader{meter: &gaugeMeter{}} }

func (r *gaugeReader) Meter(string, ...metric.MeterOption) metric.Meter { return r.meter }

func (m *gaugeMeter) Int64ObservableGauge(name string, _ ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	return &gauge{name: name}, nil
}

func (m *gaugeMeter) RegisterCallback(cb metric.Callback, _ ...metric.Observable) (metric.Registration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cbs = append(m.cbs, cb)
	return noop.Registration{}, nil
}

func (o *gaugeObserver) ObserveInt64(obs metric.Int64Observable, v int64, opts ...metric.ObserveOption) {
	g, ok := obs.(*gauge)
	if !ok {
		return
	}
	set := metric.NewObserveConfig(opts).Attributes()
	name := g.name + "{"
	for i, kv := range set.ToSlice() {
		if kv.Key == "hybridrate.node" || kv.Key == "hybridrate.instance" || kv.Key == "hybridrate.failure_policy" {
			continue
		}
		if i > 0 && name[len(name)-1] != '{' {
			name += ","
		}
		name += string(kv.Key) + "=" + kv.Value.String()
	}
	o.got[name+"}"] = v
}

func (r *gaugeReader) read() map[string]int64 {
	o := &gaugeObserver{got: map[string]int64{}}
	r.meter.mu.Lock()
	cbs := append([]metric.Callback(nil), r.meter.cbs...)
	r.meter.mu.Unlock()
	for _, cb := range cbs {
		_ = cb(context.Background(), o)
	}
	return o.got
}
