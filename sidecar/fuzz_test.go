package sidecar_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/sidecar"
)

// echo admits everything and reads every dimension it is asked about, as an Enforcer would.
type echo struct{}

func (echo) Check(_ context.Context, req *policy.Request) (policy.Result, error) {
	for _, d := range []string{"api_key", "ip", "tier", "route", "domain"} {
		req.Dims.Dimension(d)
	}
	n := sidecar.HitsCost(req)
	return policy.Result{Allowed: n < 5, Rule: "r", Decisions: []policy.Decision{{Rule: "r", Limit: 10, Remaining: 10 - n}}}, nil
}

// FuzzCheckHandler: any body gets a well-formed answer (200, 429, 400 or 413), never a panic.
func FuzzCheckHandler(f *testing.F) {
	for _, seed := range []string{
		`{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"k"}]}]}`,
		`{"descriptors":[{"entries":[{"key":"remote_address","value":"1.2.3.4"}],"hits_addend":7}],"hits_addend":4294967295}`,
		`{"descriptors":[{"entries":[]}]}`,
		`{"descriptors":[{}]}`,
		`{"descriptors":null}`,
		`[]`,
		``,
		`{"descriptors":[{"entries":[{"key":"","value":""}]}]}`,
		`{"descriptors":[{"entries":[{"key":"api_key","value":"k"}],"hits_addend":18446744073709551615}]}`,
	} {
		f.Add([]byte(seed))
	}
	srv, err := sidecar.New(echo{})
	if err != nil {
		f.Fatal(err)
	}
	h := srv.CheckHandler()
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/check", bytes.NewReader(body)))
		switch rec.Code {
		case http.StatusOK, http.StatusTooManyRequests, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body)
		}
	})
}

func TestHugeHitsAddendIsABadRequest(t *testing.T) {
	srv, err := sidecar.New(echo{})
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		`{"descriptors":[{"entries":[{"key":"api_key","value":"k"}],"hits_addend":18446744073709551615}]}`,
		`{"descriptors":[{"entries":[{"key":"api_key","value":"k"}]}],"hits_addend":4294967295}`,
	} {
		rec := httptest.NewRecorder()
		srv.CheckHandler().ServeHTTP(rec, httptest.NewRequest("POST", "/v1/check", bytes.NewBufferString(body)))
		if rec.Code != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", body, rec.Code)
		}
	}
}
