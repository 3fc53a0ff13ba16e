package middleware

import (
	"net/http"
	"net/netip"
	"strings"

	"github.com/hybridrate/hybridrate/policy"
)

// dims gives a request's dimension values to the policy, computing each on first use.
type dims struct {
	m    *Middleware
	r    *http.Request
	done uint8 // bit i: vals[i] computed
	vals [5]string
}

// indexes of the cached built-in dimensions.
const (
	dimAPIKey = iota
	dimUser
	dimIP
	dimTenant
	dimRoute
)

// Dimension implements policy.Dimensions.
func (d *dims) Dimension(name string) (string, bool) {
	i := -1
	switch name {
	case policy.DimAPIKey:
		i = dimAPIKey
	case policy.DimUser:
		i = dimUser
	case policy.DimIP:
		i = dimIP
	case policy.DimTenant:
		i = dimTenant
	case policy.DimRoute:
		i = dimRoute
	case policy.DimMethod:
		return methodValue(d.r.Method), true
	default:
		if f, ok := d.m.o.custom[name]; ok {
			v := f(d.r)
			return v, v != ""
		}
		return "", false
	}
	if d.done&(1<<i) == 0 {
		d.vals[i] = d.m.value(i, d.r)
		d.done |= 1 << i
	}
	return d.vals[i], d.vals[i] != ""
}

// value computes built-in dimension i.
func (m *Middleware) value(i int, r *http.Request) string {
	var f func(*http.Request) string
	switch i {
	case dimAPIKey:
		f = m.o.apiKey
	case dimUser:
		f = m.o.user
	case dimTenant:
		f = m.o.tenant
	case dimIP:
		return m.ipKey(r)
	case dimRoute:
		switch {
		case m.o.route != nil:
			return m.o.route(r)
		case m.o.mux != nil:
			_, p := m.o.mux.Handler(r)
			return p
		}
		return r.Pattern
	}
	if f == nil {
		return ""
	}
	return f(r)
}

// methodValue bounds the "method" dimension to the standard methods; any other is "OTHER".
func methodValue(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "OTHER"
}

// ipKey returns the "ip" dimension: the client address, IPv6 addresses cut to their prefix.
func (m *Middleware) ipKey(r *http.Request) string {
	a, ok := m.ClientIP(r)
	if !ok {
		return ""
	}
	if a.Is6() && m.o.ipv6Bits < 128 {
		p, err := a.Prefix(m.o.ipv6Bits)
		if err != nil {
			return ""
		}
		return p.String()
	}
	return a.String()
}

// ClientIP returns the address of the client that sent r: the direct peer (r.RemoteAddr), unless
// the peer is a trusted proxy ([WithTrustedProxies]), in which case the proxy header is walked from
// the right, past trusted addresses, to the first address that is not trusted. If every address is
// trusted, the leftmost one is the client. An entry that does not parse as an address ("unknown",
// an obfuscated "_hidden" identifier, garbage) stops the walk: the last trusted hop to its right is
// returned, so a forged entry can never choose the key. IPv4-mapped IPv6 addresses are unmapped and
// zones dropped. ok is false when even r.RemoteAddr does not parse. It does no I/O.
func (m *Middleware) ClientIP(r *http.Request) (netip.Addr, bool) {
	peer, ok := parseHostPort(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, false
	}
	if !m.trusted(peer) {
		return peer, true
	}
	switch m.o.proxyHeader {
	case HeaderXRealIP:
		if v := strings.TrimSpace(r.Header.Get(HeaderXRealIP)); v != "" {
			if a, ok := parseHostPort(v); ok {
				return a, true
			}
		}
		return peer, true
	case HeaderForwarded:
		return m.walk(peer, r.Header.Values(HeaderForwarded), forwardedFor)
	default:
		return m.walk(peer, r.Header.Values(HeaderXForwardedFor), func(s string) string { return s })
	}
}

// walk goes through the comma-separated entries of the header lines from the right.
func (m *Middleware) walk(peer netip.Addr, lines []string, addrOf func(string) string) (netip.Addr, bool) {
	client := peer
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for line != "" {
			var entry string
			if j := lastComma(line); j >= 0 {
				entry, line = line[j+1:], line[:j]
			} else {
				entry, line = line, ""
			}
			entry = strings.TrimSpace(entry)
			if entry == "" {
				continue
			}
			a, ok := parseHostPort(addrOf(entry))
			if !ok {
				return client, true
			}
			client = a
			if !m.trusted(a) {
				return a, true
			}
		}
	}
	return client, true
}

// lastComma returns the index of the last ',' in s outside double quotes, or -1.
func lastComma(s string) int {
	quoted := false
	for i := len(s) - 1; i >= 0; i-- {
		switch s[i] {
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				return i
			}
		}
	}
	return -1
}

// forwardedFor returns the for= value of one Forwarded element (RFC 7239), unquoted, or "".
func forwardedFor(elem string) string {
	for elem != "" {
		var pair string
		pair, elem, _ = strings.Cut(elem, ";")
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "for") {
			continue
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		return v
	}
	return ""
}

// parseHostPort parses "1.2.3.4", "1.2.3.4:80", "::1", "[::1]:80" or "[::1]".
func parseHostPort(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		s = s[1 : len(s)-1]
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	return netip.Addr{}, false
}

func (m *Middleware) trusted(a netip.Addr) bool {
	for _, p := range m.o.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
