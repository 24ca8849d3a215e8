-- @P1 = Limit, @P2 = Bound
SELECT TOP (@P1) (SELECT T.[Tenant] AS [Tenant], T.[At] AS [At], T.[Body] AS [Body] FOR JSON PATH, INCLUDE_NULL_VALUES, WITHOUT_ARRAY_WRAPPER) AS ITEM, CONVERT(NVARCHAR(MAX), T.[Tenant]) AS K1, CONVERT(NVARCHAR(MAX), T.[At], 121) AS K2 FROM [app].[Item Log] AS T WHERE T.[Row Version] <= CAST(@P2 AS BINARY(8)) AND T.[Deleted At] IS NULL ORDER BY T.[Tenant], T.[At]
