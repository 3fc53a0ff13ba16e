package policy

import (
	"reflect"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/outcome"
)

// TestAppendHybridWritesEveryField checks that appendHybrid, which writes a hybrid Decision field by
// field into a slot that may hold an older Decision, leaves exactly what hybridDecision builds: a
// field added to Decision and not written there would keep the older value and fail here, as the
// stale slot has every field set.
func TestAppendHybridWritesEveryField(t *testing.T) {
	var stale Decision
	v := reflect.ValueOf(&stale).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.String:
			f.SetString("stale")
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int64:
			f.SetInt(77)
		case reflect.Uint8:
			f.SetUint(7)
		default:
			t.Fatalf("Decision.%s is a %s: teach this test to set it", v.Type().Field(i).Name, f.Kind())
		}
	}
	p := &planned{r: &crule{id: "per-key", algo: Hybrid}, u: &unit{name: "per-key.minute", limit: 60, window: time.Minute}}
	for _, hd := range []hybrid.Decision{
		{Allowed: true, Source: outcome.SourceLocal, Remaining: 12, ResetAfter: 48 * time.Second},
		{Source: outcome.SourceCentral, Remaining: -3, RetryAfter: 2 * time.Second, ResetAfter: time.Second},
		{Unavailable: true, Source: outcome.SourceFallback, RetryAfter: -time.Second},
	} {
		ds := append(make([]Decision, 0, 2), stale, stale)
		got := appendHybrid(ds[:1], p, &hd) // over the stale second slot
		if want := hybridDecision(p, hd); len(got) != 2 || got[1] != want {
			t.Errorf("appendHybrid wrote %+v, want %+v", got[len(got)-1], want)
		}
		if got := appendHybrid(nil, p, &hd); len(got) != 1 || got[0] != hybridDecision(p, hd) {
			t.Errorf("appendHybrid to nil wrote %+v", got)
		}
	}
}
