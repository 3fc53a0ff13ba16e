package policy

import (
	"context"
	"crypto/sha256"
	"sync"
	"time"

	"github.com/hybridrate/hybridrate/internal/every"
	"github.com/hybridrate/hybridrate/internal/option"
)

// DefaultReloadInterval is how often a [Reloader] looks at its file by default.
const DefaultReloadInterval = time.Second

// Target is what a [Reloader] puts policies in force in; *Enforcer is one. SetPolicy is called from
// the Reloader's goroutine while the Target may be serving requests: an implementation must be safe
// for concurrent use.
type Target interface {
	SetPolicy(p *Policy) error
}

var _ Target = (*Enforcer)(nil)

// reloaderConfig is a Reloader's settings: Path and Target from NewReloader, the rest from its
// options (options.go).
type reloaderConfig struct {
	Path     string
	Target   Target
	Interval time.Duration   // WithReloadInterval
	OnReload func(p *Policy) // WithOnReload
	OnError  func(err error) // WithOnReloadError
}

// Reloader keeps a Target's policy in step with a file: when the file's content changes, the new
// policy takes effect without a restart; a file that does not parse or validate is rejected with an
// error naming the line, and the previous policy stays in force. It polls the file (a read and a
// SHA-256 of its content at every Interval), which works on every file system and with files
// replaced by rename (editors, Kubernetes ConfigMaps).
//
// Create it with [NewReloader], which loads the file once; then run [Reloader.Run] in a goroutine, or
// call [Reloader.Reload] yourself (say, on SIGHUP). A Reloader is safe for concurrent use.
type Reloader struct {
	cfg reloaderConfig

	mu   sync.Mutex // serialises Reload; guards last
	last [sha256.Size]byte
}

// NewReloader returns a Reloader of the policy file at path (JSON if its name ends in ".json", YAML
// otherwise) that gives every valid version of the file to target. It reads, parses and applies the
// file once, and returns an error if it cannot: a service should not start with a policy it cannot
// read. It starts nothing; see [Reloader.Run]. Errors: an empty path, a nil target or an invalid
// option (wrapping [ErrBadOption]), or the first load's error.
func NewReloader(path string, target Target, opts ...ReloaderOption) (*Reloader, error) {
	switch {
	case path == "":
		return nil, badOption("empty policy file path")
	case target == nil:
		return nil, badOption("nil Target")
	}
	cfg := reloaderConfig{Path: path, Target: target, Interval: DefaultReloadInterval}
	if err := option.Apply(&cfg, ErrBadOption, opts); err != nil {
		return nil, err
	}
	r := &Reloader{cfg: cfg}
	if err := r.reload(false); err != nil {
		return nil, err
	}
	return r, nil
}

// Run reads the file every Interval until ctx ends, applying each new valid content; it returns
// ctx's error.
func (r *Reloader) Run(ctx context.Context) error {
	every.Tick(ctx, r.cfg.Interval, func() { _ = r.Reload() })
	return ctx.Err()
}

// Reload reads the file now and applies it if its content changed since the last look. It returns
// the error it reported to OnError, or nil (also when nothing changed).
func (r *Reloader) Reload() error { return r.reload(true) }

// reload reads the file and, when its content changed, parses and applies it. With report set it
// tells the callbacks (NewReloader's first load returns its error instead).
func (r *Reloader) reload(report bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	data, err := readFile(r.cfg.Path)
	if err != nil {
		// An unreadable file (being replaced, say) is reported once per distinct error text.
		sum := sha256.Sum256([]byte("\x00error\x00" + err.Error()))
		if sum == r.last {
			return nil
		}
		r.last = sum
		if report && r.cfg.OnError != nil {
			r.cfg.OnError(err)
		}
		return err
	}
	sum := sha256.Sum256(data)
	if sum == r.last {
		return nil
	}
	r.last = sum
	p, err := Parse(data, r.cfg.Path)
	if err == nil {
		err = r.cfg.Target.SetPolicy(p)
	}
	if err != nil {
		if report && r.cfg.OnError != nil {
			r.cfg.OnError(err)
		}
		return err
	}
	if report && r.cfg.OnReload != nil {
		r.cfg.OnReload(p)
	}
	return nil
}
