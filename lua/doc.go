// Package lua holds the Redis Lua scripts of packages central and concurrency, embedded with go:embed.
//
// Each .lua file starts with a header that documents its KEYS, ARGV and reply. The scripts use Redis
// TIME as their only clock, keep fractional tokens as Lua numbers stored with full precision (numbers
// passed to redis.call are formatted with 17 significant digits) and return integers only (micro-tokens,
// microseconds), because Redis truncates Lua numbers in replies. Every script validates its numeric
// arguments and answers an error reply, never a poisoned bucket, for NaN, infinities or values out of range.
package lua
