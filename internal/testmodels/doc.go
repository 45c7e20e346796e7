package testmodels

//go:generate go run ./gen -o ../../testdata
