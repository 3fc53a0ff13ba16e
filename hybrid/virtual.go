package hybrid

import (
	"context"
	"time"

	"github.com/hybridrate/hybridrate/internal/virtual"
)

// The fleet simulator's hooks (internal/virtual): a limiter on simulated time, stepped by the
// simulator instead of its own loops.
func init() {
	virtual.Option = func(now func() time.Time) any {
		return optionFunc(func(o *options) error {
			origin := now()
			o.now = now
			o.mono = func() int64 { return max(int64(now().Sub(origin)), 0) + 1 }
			o.scriptNow = func() int64 { return now().UnixMicro() }
			o.manual = true
			return nil
		})
	}
	virtual.Step = func(ctx context.Context, lim any) error {
		l := lim.(*Limiter)
		l.stepFleet(ctx)
		return l.syncer.Tick(ctx)
	}
}
