package relay

import (
	"bytes"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/central"
)

func TestWireRoundTrip(t *testing.T) {
	in := []central.Update{
		{Key: "a\x00{b}", Limit: central.Limit{Rate: 0.5, Burst: 3}, Inc: 7, Cum: 9, Acked: 8, Used: 6, UAcked: 5, Demand: 1.25, Want: 4, N: 2},
		{Key: "k", Limit: central.Limit{Rate: 1e6, Burst: 1e6}, N: 1, Vetted: true},
	}
	b, err := appendRequest(nil, "node-1", in)
	if err != nil {
		t.Fatal(err)
	}
	node, got, err := parseRequest(b)
	if err != nil || node != "node-1" || len(got) != 2 || got[0] != in[0] || got[1] != in[1] {
		t.Fatalf("round trip: %q %+v %v", node, got, err)
	}
	out := []central.State{{Status: central.StatusCovered, Charged: 4, Tokens: -3, Demand: 2.5, RetryAfter: time.Millisecond, ResetAfter: time.Second}, {}, {}}
	errs := []error{nil, errors.New("boom"), ErrFull}
	resp := appendResponse(nil, out, errs)
	o2, e2 := make([]central.State, 3), make([]error, 3)
	if err := parseResponse(resp, o2, e2); err != nil {
		t.Fatal(err)
	}
	var re *RemoteError
	if o2[0] != out[0] || e2[0] != nil || !errors.As(e2[1], &re) || re.Msg != "boom" || !errors.Is(e2[2], ErrFull) {
		t.Errorf("response round trip: %+v %v", o2, e2)
	}
	if _, err := appendRequest(nil, "", in); err == nil {
		t.Error("empty node id accepted")
	}
	if _, err := appendRequest(nil, "n", []central.Update{{Key: string(make([]byte, maxWireKeyLen+1))}}); err == nil {
		t.Error("over-long key accepted")
	}
}

// FuzzParseRequest: any bytes are parsed without panicking, and what parses encodes back to the
// same bytes; what parses and passes valid has numbers the relay can use.
func FuzzParseRequest(f *testing.F) {
	good, _ := appendRequest(nil, "n", []central.Update{{Key: "k", Limit: central.Limit{Rate: 1, Burst: 2}, Inc: 1, Want: 1}})
	f.Add(good)
	f.Add([]byte{1, 1, 'n', 0, 0})
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		node, ups, err := parseRequest(b)
		if err != nil {
			return
		}
		again, err := appendRequest(nil, node, ups)
		if err != nil {
			t.Fatalf("parsed but cannot encode: %v", err)
		}
		// NaN payloads may differ in bits only through Float64bits, which round-trips them.
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoded %x, was %x", again, b)
		}
		for _, u := range ups {
			if valid(node, u) == nil && (math.IsNaN(u.Limit.Rate) || u.N > u.Limit.Burst || u.Cum < 0) {
				t.Fatalf("valid passed %+v", u)
			}
		}
	})
}

// FuzzParseResponse: any bytes are parsed without panicking.
func FuzzParseResponse(f *testing.F) {
	f.Add(appendResponse(nil, []central.State{{Status: 1}}, []error{nil}))
	f.Add([]byte{1, 1, 0, 1, 5, 0, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		out, errs := make([]central.State, 2), make([]error, 2)
		_ = parseResponse(b, out, errs)
	})
}
