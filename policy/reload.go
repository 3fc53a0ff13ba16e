package policy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"
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

// ReloaderConfig configures a [Reloader]. Path and Target are required. The zero ReloaderConfig is
// invalid. It is a plain value; NewReloader copies it.
type ReloaderConfig struct {
	// Path is the policy file: JSON if its name ends in ".json", YAML otherwise.
	Path string
	// Target receives every valid version of the file.
	Target Target
	// Interval is how often Run reads the file, at least 1ms; the default is DefaultReloadInterval (1s).
	Interval time.Duration
	// OnReload, when set, is called after a changed file has been put in force.
	OnReload func(p *Policy)
	// OnError, when set, is called when a changed file cannot be read, parsed or put in force (the
	// error names the file and line); the previous policy stays in force. It is called once per
	// distinct content of the file, not at every look.
	OnError func(err error)
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
	cfg ReloaderConfig

	mu   sync.Mutex // serialises Reload; guards last
	last [sha256.Size]byte
}

// NewReloader reads, parses and applies the file once, and returns an error if it cannot: a service
// should not start with a policy it cannot read. It starts nothing; see [Reloader.Run].
func NewReloader(cfg ReloaderConfig) (*Reloader, error) {
	switch {
	case cfg.Path == "":
		return nil, errors.New("policy: ReloaderConfig.Path is empty")
	case cfg.Target == nil:
		return nil, errors.New("policy: ReloaderConfig.Target is nil")
	case cfg.Interval == 0:
		cfg.Interval = DefaultReloadInterval
	case cfg.Interval < time.Millisecond:
		return nil, fmt.Errorf("policy: ReloaderConfig.Interval %v: want at least 1ms", cfg.Interval)
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
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			_ = r.Reload()
		}
	}
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
