package policy

import (
	"sort"
	"strings"

	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/outcome"
)

// compiled is a policy ready for Check.
type compiled struct {
	src         *Policy
	gen         uint64
	shadowAll   bool
	domain      string        // Policy.Domain
	unknown     UnknownDomain // Policy.UnknownDomain
	tagDim      string        // Policy.StrictTag
	defaultTier string
	tiers       map[string]bool
	enforced    []*crule // hybrid ones first (most dimensions first, then file order), then strict ones
	nHybrid     int      // enforced[:nHybrid] are hybrid
	shadow      []*crule
	needRoute   bool              // some rule matches on routes
	byID        map[string]*crule // every rule by id, when the policy has Select set
}

// crule is a compiled rule.
type crule struct {
	id        string
	algo      Algorithm
	strict    bool
	shadow    bool
	dims      []string
	routes    map[string]bool // nil: any
	methods   []string        // upper case; nil: any
	tiers     map[string]bool // nil: any
	units     []unit
	byTier    map[string][]unit
	missing   MissingKey
	fixed     int64
	ownCost   bool // the rule sets a cost: Request.Cost does not apply
	perMethod map[string]int64
	costFunc  CostFunc
	failure   outcome.FailurePolicy
	lim       *hybrid.Limiter // hybrid rules
}

// compileLocked prepares a normalized policy for Check, creating the hybrid limiter if it has hybrid
// rules and none exists yet. The caller holds e.mu.
func (e *Enforcer) compileLocked(p *Policy, norm *normalized) (*compiled, error) {
	e.gen++
	c := &compiled{src: p, gen: e.gen, shadowAll: p.Shadow, domain: p.Domain, unknown: p.UnknownDomain, tagDim: p.StrictTag, defaultTier: p.DefaultTier,
		tiers: make(map[string]bool, len(p.Tiers))}
	for name := range p.Tiers {
		c.tiers[name] = true
	}
	var hyb, str []*crule
	for _, nr := range norm.rules {
		r := nr.rule
		cr := &crule{
			id: r.ID, algo: nr.algo, strict: nr.algo != Hybrid, shadow: r.Shadow, dims: nr.dims,
			units: nr.units, byTier: nr.byTier, missing: nr.missing, fixed: max(r.Cost.Fixed, 1),
			costFunc: nr.cost, failure: r.OnFailure,
			ownCost: r.Cost.Fixed > 0 || len(r.Cost.PerMethod) > 0 || nr.cost != nil,
		}
		if cr.failure == outcome.DefaultFailure {
			cr.failure = outcome.LocalFallback // a rule's default, whatever HybridOptions say
		}
		if len(r.Cost.PerMethod) > 0 {
			cr.perMethod = make(map[string]int64, len(r.Cost.PerMethod))
			for m, n := range r.Cost.PerMethod {
				cr.perMethod[m] = n
			}
		}
		if len(r.Match.Routes) > 0 {
			c.needRoute = true
			cr.routes = make(map[string]bool, len(r.Match.Routes))
			for _, rt := range r.Match.Routes {
				cr.routes[rt] = true
			}
		}
		for _, m := range r.Match.Methods {
			cr.methods = append(cr.methods, strings.ToUpper(m))
		}
		if len(r.Match.Tiers) > 0 {
			cr.tiers = make(map[string]bool, len(r.Match.Tiers))
			for _, t := range r.Match.Tiers {
				cr.tiers[t] = true
			}
		}
		if !cr.strict {
			l, err := e.limiterLocked()
			if err != nil {
				return nil, err
			}
			cr.lim = l
			withFailure(cr.units, cr.failure)
			for _, us := range cr.byTier {
				withFailure(us, cr.failure)
			}
		}
		if p.Select {
			if c.byID == nil {
				c.byID = make(map[string]*crule, len(norm.rules))
			}
			c.byID[cr.id] = cr
		}
		switch {
		case cr.shadow:
			c.shadow = append(c.shadow, cr)
		case cr.strict:
			str = append(str, cr)
		default:
			hyb = append(hyb, cr)
		}
	}
	// Narrowest hybrid rules first: a subject over its own limit is denied before it consumes from
	// broader, shared rules.
	sort.SliceStable(hyb, func(i, j int) bool { return len(hyb[i].dims) > len(hyb[j].dims) })
	c.enforced = append(hyb, str...)
	c.nHybrid = len(hyb)
	return c, nil
}
