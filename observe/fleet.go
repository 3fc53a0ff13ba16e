package observe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/option"
)

// Defaults of the Fleet's options.
const (
	DefaultFleetInterval = 5 * time.Second
	DefaultFleetStep     = 10 * time.Second
	DefaultFleetPoints   = 30
	DefaultFleetSubjects = 20
	// MaxFleetPoints and MaxFleetSubjects bound WithTrend's points and WithTopSubjects.
	MaxFleetPoints   = 360
	MaxFleetSubjects = 100
	// MaxFleetInstances bounds the reports a Fleet reads: the most recent ones.
	MaxFleetInstances = 256
)

// fleetName is the internal name of the fleet's index; each report is fleetName + ":" + its id.
const fleetName = "{dashboard}"

// fleetConfig is a Fleet's settings: Redis from NewFleet, the rest from its options (options.go);
// the zero values stand for the defaults NewFleet fills in.
type fleetConfig struct {
	Redis     redis.UniversalClient
	KeyPrefix string        // WithKeyPrefix
	Interval  time.Duration // WithReportInterval
	TTL       time.Duration // WithReportTTL
	Step      time.Duration // WithTrend
	Points    int           // WithTrend
	Subjects  int           // WithTopSubjects
	ID        string        // WithReportID
	Logger    *slog.Logger  // WithLogger
}

// Fleet publishes an [Observer]'s counters to Redis and reads every live instance's, so that any
// instance's dashboard can show the whole fleet. Each instance writes one small report every
// Interval (one pipelined round trip: SET with a TTL, ZADD, ZREMRANGEBYSCORE, EXPIRE); a reader
// makes one ZRANGEBYSCORE and one MGET, at most once a second, whoever asks. Reports hold counts,
// rule ids and hashed keys, never a raw key. Create it with [NewFleet] and run [Fleet.Run]; it is
// safe for concurrent use.
type Fleet struct {
	o     *Observer
	cfg   fleetConfig
	index string

	mu       sync.Mutex // guards the fields below
	cached   FleetView
	cachedAt time.Time
	failing  bool // the last write failed (logged once per streak)
}

// NewFleet returns a Fleet publishing o's counters to rdb, the limiter's Redis, configured by opts.
// It does no I/O. Errors: a nil Observer or rdb, or an invalid option (wrapping [ErrBadOption]),
// among them a report TTL under the interval plus 1s and a trend reaching beyond the Observer's
// window (WithWindow).
func NewFleet(o *Observer, rdb redis.UniversalClient, opts ...FleetOption) (*Fleet, error) {
	if o == nil || rdb == nil {
		return nil, badOption("NewFleet needs an Observer and a Redis client")
	}
	cfg := fleetConfig{Redis: rdb}
	if err := option.Apply(&cfg, ErrBadOption, opts); err != nil {
		return nil, err
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = hybrid.DefaultKeyPrefix
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultFleetInterval
	}
	if cfg.TTL == 0 {
		cfg.TTL = max(3*cfg.Interval, 10*time.Second)
	}
	if cfg.Step == 0 {
		cfg.Step = DefaultFleetStep
	}
	if cfg.Points == 0 {
		cfg.Points = DefaultFleetPoints
	}
	if cfg.Subjects == 0 {
		cfg.Subjects = DefaultFleetSubjects
	}
	switch {
	case cfg.TTL < cfg.Interval+time.Second:
		return nil, badOption("report TTL %v: want at least the report interval (%v) + 1s", cfg.TTL, cfg.Interval)
	case time.Duration(cfg.Points)*cfg.Step > o.cfg.Window:
		return nil, badOption("trend of %d × %v (%v) reaches beyond the Observer's window (%v)",
			cfg.Points, cfg.Step, time.Duration(cfg.Points)*cfg.Step, o.cfg.Window)
	}
	if cfg.ID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		cfg.ID = o.cfg.Instance + "-" + hex.EncodeToString(b[:])
	}
	return &Fleet{o: o, cfg: cfg, index: hybrid.InternalKey(cfg.KeyPrefix, fleetName)}, nil
}

// ID returns the id of this instance's report. It does no I/O.
func (f *Fleet) ID() string { return f.cfg.ID }

// Report is what one instance publishes: its trend and most denied hashed keys over the last
// Points steps, and its totals. The zero Report is empty. It is a plain value, the caller's once
// returned: safe to copy and to read from any goroutine.
type Report struct {
	ID       string     `json:"id"`
	Instance string     `json:"instance"`
	At       time.Time  `json:"at"`       // when it was written
	Interval float64    `json:"interval"` // seconds between writes
	Trend    Trend      `json:"trend"`
	Subjects []KeyCount `json:"subjects"` // most denied first; Subject is always empty
	Totals   Totals     `json:"totals"`   // since the instance started
	OK       bool       `json:"ok"`       // every circuit breaker of the instance is closed
}

// report returns this instance's report now.
func (f *Fleet) report() Report {
	now := f.o.cfg.Now()
	tr := f.o.win.trend(now, f.cfg.Step, f.cfg.Points)
	return Report{ID: f.cfg.ID, Instance: f.o.cfg.Instance, At: now, Interval: f.cfg.Interval.Seconds(), Trend: tr,
		Subjects: f.o.topKeys(time.Unix(tr.Start, 0), now, f.cfg.Subjects),
		Totals: Totals{Allowed: f.o.win.allowed.Load(), Denied: f.o.win.denied.Load(),
			ShadowDenied: f.o.win.shadowDenied.Load(), Errors: f.o.win.errs.Load()},
		OK: f.o.Health().OK}
}

// Publish writes this instance's report now. It makes one pipelined Redis round trip; its error is
// that round trip's, wrapped, and the report may then be missing from the fleet view until a later
// Publish.
func (f *Fleet) Publish(ctx context.Context) error {
	b, err := json.Marshal(f.report())
	if err != nil {
		return fmt.Errorf("observe: fleet report: %w", err)
	}
	now := f.o.cfg.Now()
	_, err = f.cfg.Redis.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, f.index+":"+f.cfg.ID, b, f.cfg.TTL)
		p.ZAdd(ctx, f.index, redis.Z{Score: float64(now.UnixMilli()), Member: f.cfg.ID})
		p.ZRemRangeByScore(ctx, f.index, "-inf", strconv.FormatInt(now.Add(-f.cfg.TTL).UnixMilli(), 10))
		p.PExpire(ctx, f.index, f.cfg.TTL)
		return nil
	})
	if err != nil {
		return fmt.Errorf("observe: fleet report: %w", err)
	}
	return nil
}

// Run publishes this instance's report every Interval until ctx ends, then removes it (so that the
// fleet view drops the instance at once). Write failures are logged (Logger), one line per streak,
// never returned; the removal is one Redis round trip bounded by a second.
func (f *Fleet) Run(ctx context.Context) {
	t := time.NewTicker(f.cfg.Interval)
	defer t.Stop()
	for {
		err := f.Publish(ctx)
		f.mu.Lock()
		was := f.failing
		f.failing = err != nil
		f.mu.Unlock()
		if log := f.cfg.Logger; log != nil && err != nil && !was && ctx.Err() == nil {
			log.Warn("observe: cannot publish the fleet report; the fleet view misses this instance", "err", err)
		}
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_, _ = f.cfg.Redis.Pipelined(dctx, func(p redis.Pipeliner) error {
				p.Del(dctx, f.index+":"+f.cfg.ID)
				p.ZRem(dctx, f.index, f.cfg.ID)
				return nil
			})
			cancel()
			return
		case <-t.C:
		}
	}
}

// Reports returns the reports of the live instances, at most MaxFleetInstances (the most recently
// written), ordered by instance name and id. It makes two Redis round trips (ZRANGEBYSCORE, MGET),
// uncached. Errors: either call's, wrapped; a report that does not decode is left out, not an
// error.
func (f *Fleet) Reports(ctx context.Context) ([]Report, error) {
	now := f.o.cfg.Now()
	ids, err := f.cfg.Redis.ZRevRangeByScore(ctx, f.index, &redis.ZRangeBy{
		Min: strconv.FormatInt(now.Add(-f.cfg.TTL).UnixMilli(), 10), Max: "+inf", Count: MaxFleetInstances}).Result()
	if err != nil {
		return nil, fmt.Errorf("observe: fleet index: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = f.index + ":" + id
	}
	vals, err := f.cfg.Redis.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("observe: fleet reports: %w", err)
	}
	out := make([]Report, 0, len(vals))
	for _, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue // expired between the two reads
		}
		var r Report
		if json.Unmarshal([]byte(s), &r) != nil || r.Trend.Step < 1 || len(r.Trend.Checks) != len(r.Trend.Denied) {
			continue // not a report this version can read
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Instance != out[j].Instance {
			return out[i].Instance < out[j].Instance
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// FleetView is the fleet as one instance's dashboard shows it: every live instance's report, and
// their sum. The zero FleetView has no instances. It is a plain value, the caller's once returned:
// safe to copy and to read from any goroutine.
type FleetView struct {
	Now       time.Time      `json:"now"`
	Self      string         `json:"self"` // the id of the instance that answered
	Instances []FleetMember  `json:"instances"`
	Sum       Trend          `json:"sum"`      // the instances' trends added up, step by step
	Subjects  []FleetSubject `json:"subjects"` // the most denied hashed keys across the fleet
}

// FleetMember is one live instance in a [FleetView]: its report, and its age. The zero FleetMember
// is empty. It is a plain value, the caller's once returned: safe to copy and to read from any
// goroutine.
type FleetMember struct {
	Report
	Age  float64 `json:"age"`  // seconds since the report was written
	Self bool    `json:"self"` // the instance that answered
}

// FleetSubject is one hashed key's denials across the fleet. The zero FleetSubject is empty. It is
// a plain value, the caller's once returned: safe to copy and to read from any goroutine.
type FleetSubject struct {
	KeyCount
	Instances []string `json:"instances"` // the instances that denied it
}

// View returns the fleet view: the live instances' reports (this instance's made now, not read
// back), added up. Views are cached for a second, so that many open dashboards cost Redis one read
// a second. Errors: Reports' (the view is then not cached).
func (f *Fleet) View(ctx context.Context) (FleetView, error) {
	now := f.o.cfg.Now()
	f.mu.Lock()
	if !f.cachedAt.IsZero() && now.Sub(f.cachedAt) < time.Second && !now.Before(f.cachedAt) {
		v := f.cached
		f.mu.Unlock()
		return v, nil
	}
	f.mu.Unlock()
	reports, err := f.Reports(ctx)
	if err != nil {
		return FleetView{}, err
	}
	v := f.view(now, reports)
	f.mu.Lock()
	f.cached, f.cachedAt = v, now
	f.mu.Unlock()
	return v, nil
}

// view adds up reports (replacing this instance's with a fresh one) as of now.
func (f *Fleet) view(now time.Time, reports []Report) FleetView {
	self := f.report()
	v := FleetView{Now: now, Self: f.cfg.ID}
	found := false
	for i := range reports {
		if reports[i].ID == f.cfg.ID {
			reports[i], found = self, true
		}
	}
	if !found {
		reports = append(reports, self)
		sort.Slice(reports, func(i, j int) bool {
			if reports[i].Instance != reports[j].Instance {
				return reports[i].Instance < reports[j].Instance
			}
			return reports[i].ID < reports[j].ID
		})
	}
	st := self.Trend.Step
	points := int64(len(self.Trend.Checks))
	v.Sum = Trend{Start: self.Trend.Start, Step: st, Checks: make([]int64, points), Denied: make([]int64, points)}
	rules := map[ruleShadow][]int64{}
	type subjectKey struct {
		key, rule string
		shadow    bool
	}
	subjects := map[subjectKey]*FleetSubject{}
	for _, r := range reports {
		m := FleetMember{Report: r, Age: max(now.Sub(r.At).Seconds(), 0), Self: r.ID == f.cfg.ID}
		f.o.reveal.annotate(m.Subjects)
		v.Instances = append(v.Instances, m)
		// Each of r's steps adds to the sum's step that holds its start (the same step when both
		// use one Step; a report written with another Step is spread as well as it can be).
		at := func(i int) int64 { return (r.Trend.Start + int64(i)*r.Trend.Step - v.Sum.Start) / st }
		for i := range r.Trend.Checks {
			if b := at(i); b >= 0 && b < points {
				v.Sum.Checks[b] += r.Trend.Checks[i]
				v.Sum.Denied[b] += r.Trend.Denied[i]
			}
		}
		for _, rt := range r.Trend.Rules {
			k := ruleShadow{rt.Rule, rt.Shadow}
			s := rules[k]
			if s == nil {
				s = make([]int64, points)
				rules[k] = s
			}
			for i, n := range rt.Series {
				if b := at(i); b >= 0 && b < points {
					s[b] += n
				}
			}
		}
		for _, kc := range r.Subjects {
			k := subjectKey{kc.Key, kc.Rule, kc.Shadow}
			s := subjects[k]
			if s == nil {
				s = &FleetSubject{KeyCount: KeyCount{Key: kc.Key, Rule: kc.Rule, Shadow: kc.Shadow}}
				subjects[k] = s
			}
			s.N += kc.N
			s.Instances = append(s.Instances, r.Instance)
		}
	}
	for k, s := range rules {
		var n int64
		for _, x := range s {
			n += x
		}
		v.Sum.Rules = append(v.Sum.Rules, RuleTrend{Rule: k.rule, Shadow: k.shadow, N: n, Series: s})
	}
	v.Sum.Rules = capRules(v.Sum.Rules, maxTrendRules)
	for _, s := range subjects {
		if sub, ok := f.o.reveal.get(s.Key); ok {
			s.Subject = sub
		}
		v.Subjects = append(v.Subjects, *s)
	}
	sort.Slice(v.Subjects, func(i, j int) bool {
		a, b := v.Subjects[i], v.Subjects[j]
		if a.N != b.N {
			return a.N > b.N
		}
		return a.Key+a.Rule < b.Key+b.Rule
	})
	if len(v.Subjects) > f.cfg.Subjects {
		v.Subjects = v.Subjects[:f.cfg.Subjects]
	}
	return v
}
