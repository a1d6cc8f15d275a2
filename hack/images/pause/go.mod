module gpushare.local/pause

go 1.22
