package observe

import (
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/hybridrate/hybridrate/internal/option"
)

// ErrBadOption is wrapped by every error of an invalid or nil option, and of a missing required
// argument, given to [New] or [NewFleet].
var ErrBadOption = errors.New("observe: bad option")

func badOption(format string, args ...any) error { return option.Bad(ErrBadOption, format, args...) }

// Option configures an [Observer]; see the With functions that return one. Options are immutable
// values, safe to share between goroutines and to pass to several New calls.
type Option interface{ option.Setter[config] }

type optionFunc = option.Func[config]

// WithMeterProvider sets the provider that receives the metrics; nil means the default,
// otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) error {
		c.MeterProvider = mp
		return nil
	})
}

// WithInstance sets the value of the hybridrate.instance attribute: a stable name of the process.
// Empty means the default, hybrid.DefaultInstance() (the host name).
func WithInstance(name string) Option {
	return optionFunc(func(c *config) error {
		c.Instance = name
		return nil
	})
}

// WithNearLimit sets the share of a counter's quota at or under which an admitted decision counts
// as near the limit, in (0, 1]. The default is DefaultNearLimit (0.1).
func WithNearLimit(share float64) Option {
	return optionFunc(func(c *config) error {
		if !(share > 0 && share <= 1) {
			return badOption("near limit %v: want (0, 1]", share)
		}
		c.NearLimit = share
		return nil
	})
}

// WithMaxLabels bounds the distinct route and tier values (each) used as attributes, at least 1;
// later ones are recorded as "other". The default is DefaultMaxLabels (256).
func WithMaxLabels(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return badOption("max labels %d: want at least 1", n)
		}
		c.MaxLabels = n
		return nil
	})
}

// WithWindow sets how far back the in-memory window (Snapshot, the dashboard) reaches, in whole
// seconds, from 10s to 1h. The default is DefaultWindow (5 minutes).
func WithWindow(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 10*time.Second || d > time.Hour {
			return badOption("window %v out of range [10s, 1h]", d)
		}
		c.Window = d
		return nil
	})
}

// WithHashKey sets the key of the HMAC that turns a denied request's dimension values into
// Event.Key. The default (as is an empty key) is a random key per Observer: keys are comparable
// within one process only. Give every instance of a fleet the same key to give one subject the same
// Event.Key on each of them (the fleet view then adds up a subject's denials across instances).
// The key is copied.
func WithHashKey(key []byte) Option {
	return optionFunc(func(c *config) error {
		c.HashKey = append([]byte(nil), key...)
		return nil
	})
}

// WithRevealSubjects keeps in memory the readable dimension values of up to n denied subjects (the
// newest), so that the dashboard shows "api_key=abc…" next to a hashed key that this process saw
// denied. The values never leave the process: fleet reports in Redis carry only the hashed keys.
// Values are cut at 64 bytes. n is from 0 to MaxRevealSubjects; the default, 0, keeps none.
func WithRevealSubjects(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 0 || n > MaxRevealSubjects {
			return badOption("reveal subjects %d: want 0 to %d", n, MaxRevealSubjects)
		}
		c.RevealSubjects = n
		return nil
	})
}

// WithOnDecision sets a function called after every check, on the request's goroutine: keep it
// fast. The Event and its Result.Decisions are valid only during the call. nil, the default, calls
// nothing.
func WithOnDecision(f func(ev *Event)) Option {
	return optionFunc(func(c *config) error {
		c.OnDecision = f
		return nil
	})
}

// WithOnDeny sets a function called after every check that denied (or, in shadow mode, would have
// denied) the request, after the WithOnDecision function, on the request's goroutine. nil, the
// default, calls nothing.
func WithOnDeny(f func(ev *Event)) Option {
	return optionFunc(func(c *config) error {
		c.OnDeny = f
		return nil
	})
}

// WithClock sets the clock of the window and of latencies; nil means time.Now, the default.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) error {
		c.Now = now
		return nil
	})
}

// FleetOption configures a [Fleet]; see WithKeyPrefix, WithReportInterval, WithReportTTL, WithTrend,
// WithTopSubjects, WithReportID and WithLogger. Options are immutable values, safe to share.
type FleetOption interface{ option.Setter[fleetConfig] }

type fleetOptionFunc = option.Func[fleetConfig]

// WithKeyPrefix sets the prefix of the fleet's keys, as the limiter's WithKeyPrefix does (1 to 64
// bytes with no braces or whitespace); the default is hybrid.DefaultKeyPrefix ("hr"). The keys are
// "<prefix>:v3:x:{dashboard}" (a sorted set: report id → time of its last write) and
// "<prefix>:v3:x:{dashboard}:<id>" (a string: the report as JSON, with a TTL), in the limiter's own
// namespace, which no user key can reach; one hash tag, so one Cluster slot.
func WithKeyPrefix(p string) FleetOption {
	return fleetOptionFunc(func(c *fleetConfig) (err error) {
		c.KeyPrefix, err = option.KeyPrefix(ErrBadOption, p)
		return err
	})
}

// WithReportInterval sets how often Fleet.Run writes this instance's report, at least 100ms. The
// default is DefaultFleetInterval (5s).
func WithReportInterval(d time.Duration) FleetOption {
	return fleetOptionFunc(func(c *fleetConfig) error {
		if d < 100*time.Millisecond {
			return badOption("report interval %v: want at least 100ms", d)
		}
		c.Interval = d
		return nil
	})
}

// WithReportTTL sets how long a report outlives its last write (an instance that stopped leaves the
// fleet view after it), at least the report interval plus 1s (NewFleet checks). The default is
// three report intervals, at least 10s.
func WithReportTTL(d time.Duration) FleetOption {
	return fleetOptionFunc(func(c *fleetConfig) error {
		if d <= 0 {
			return badOption("report TTL %v: want a positive duration", d)
		}
		c.TTL = d
		return nil
	})
}

// WithTrend shapes the trend a report carries: points steps of step. step is whole seconds; points
// is 1 to MaxFleetPoints, and points × step must not reach beyond the Observer's window (NewFleet
// checks). The defaults are DefaultFleetStep (10s) and DefaultFleetPoints (30): 5 minutes.
func WithTrend(step time.Duration, points int) FleetOption {
	return fleetOptionFunc(func(c *fleetConfig) error {
		switch {
		case step < time.Second || step%time.Second != 0:
			return badOption("trend step %v: want whole seconds", step)
		case points < 1 || points > MaxFleetPoints:
			return badOption("trend points %d: want 1 to %d", points, MaxFleetPoints)
		}
		c.Step, c.Points = step, points
		return nil
	})
}

// WithTopSubjects sets how many of the most denied hashed keys a report carries, 1 to
// MaxFleetSubjects. The default is DefaultFleetSubjects (20).
func WithTopSubjects(n int) FleetOption {
	return fleetOptionFunc(func(c *fleetConfig) error {
		if n < 1 || n > MaxFleetSubjects {
			return badOption("top subjects %d: want 1 to %d", n, MaxFleetSubjects)
		}
		c.Subjects = n
		return nil
	})
}

// WithReportID names this instance's report. The default (as is the empty id) is the Observer's
// instance, a '-' and 8 random hex digits, so that two processes given one instance name never
// overwrite each other.
func WithReportID(id string) FleetOption {
	return fleetOptionFunc(func(c *fleetConfig) error {
		c.ID = id
		return nil
	})
}

// WithLogger sets where the failed writes and reads are logged (one line per failure streak). The
// default discards them.
func WithLogger(l *slog.Logger) FleetOption {
	return fleetOptionFunc(func(c *fleetConfig) (err error) {
		c.Logger, err = option.NonNil(ErrBadOption, "logger", l)
		return err
	})
}
